"""Lucid's memory library: the pure model (entries, upsert, scoring, lifecycle) and the one store. Nothing
here imports Redis, RQ, HTTP or Feishu code; locks, clocks and model clients are passed in."""
