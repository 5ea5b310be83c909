"""Plain ``nn.Module``s and distributions: no optimisers, no configs, no devices (DESIGN.md section 1)."""
