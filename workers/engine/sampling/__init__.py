"""Token choice, shared by every backend that has logits: each row's logits adjusted (penalties.py),
masked by its grammar (structured.py), sampled (sampler.py) and scored (logprobs.py), in that order
(choice.py). Plain numpy, so a backend without torch chooses exactly as one with it."""
