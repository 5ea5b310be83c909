"""How the computation runs: precision, ``torch.compile``, CPU memory, and data-parallel processes (set up,
collectives, launch, signals)."""
