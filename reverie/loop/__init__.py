"""The training loop's parts: the collector thread (``train.control_hz``), evaluation, progress, clocks and
the loop's own state (:class:`reverie.loop.state.LoopState`)."""
