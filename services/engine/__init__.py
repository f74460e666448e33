"""Everything that touches vLLM or torch: the engine worker, its stats, the vision encoder.

protocol.py       Engine: what the pipeline needs of an engine; ServedEngine: what the server
                  needs besides; EngineFactory: what MmgateServer takes (tests pass a fake)
plan.py           EnginePlan: what the engine starts with, decided before it starts
worker.py         EngineWorker: one vLLM AsyncLLM, start, generate, abort, stats, close
synthetic.py      SyntheticLLM: AsyncLLM.generate's stand-in, a GPU's batching at no CPU
synthetic_engine.py  SyntheticEngine: mmgate's ServedEngine over it (load tests only)
factory.py        configured_engine: vLLM, or the synthetic engine where the settings name it
outputs.py        vLLM's RequestOutput read once, into EngineDelta
stats.py          a vLLM stat logger into EngineStats and EngineTokenStats
encoder.py        VisionEncoder: a LLaVA model's tower and projector, run by mmgate
tensors.py        tensor weights, images in the engine's form
vision_compat.py  torchvision importable beside a CPU torch (a .pth hook imports it at every
                  interpreter start: this package's __init__ therefore imports nothing)
"""
