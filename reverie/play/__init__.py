"""``reverie play RUN``: a local web page to play inside a run's world model next to the real env (docs/play.md)."""
