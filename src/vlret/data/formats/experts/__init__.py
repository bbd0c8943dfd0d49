"""Per-video multi-expert features (CE, MMT): the layout, the released pickles, the batch."""
