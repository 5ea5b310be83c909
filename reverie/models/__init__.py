"""Plain ``nn.Module``s and distributions: no optimisers, no configs, no devices (docs/architecture.md)."""
