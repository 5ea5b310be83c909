"""How the computation runs: precision, ``torch.compile``, CPU memory, threads and data-parallel processes."""
