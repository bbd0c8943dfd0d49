"""The trainer's extension points (:mod:`.core`), the hooks a config builds
(:mod:`.from_config`) and the zero-shot check during training (:mod:`.zeroshot`)."""
