"""Training on several processes: ``torch.distributed`` set-up, gathering and sharding
(:mod:`.distributed`), the ring exchange of text blocks (:mod:`.ring`) and gradient caching
(:mod:`.grad_cache`)."""
