"""One request, no gRPC: the stages a request walks through, top-down (generation.py).

request.py    Request: what every stage needs, in one object; deadlines
generation.py Pipeline: prompt ─▶ budget ─▶ media ─▶ shared response or engine ─▶ Finished
prompts.py    the prompt stage (render + tokenize, cached)
budget.py     the context window and max_tokens
responses.py  shared responses (one engine run for identical deterministic requests)
runner.py     EngineRunner: every engine run through the queue, fault injection, the engine
queue.py      the queue for the engine's slots (weighted fair queuing across tenants)
media/        the image codec and one stage class per media mode
"""
