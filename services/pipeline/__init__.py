"""One request, no gRPC: the stages a request walks through, top-down (generation.py).

request.py    Request: what every stage needs, in one object; deadlines
generation.py Pipeline: prompt ─▶ budget ─▶ media ─▶ shared response or engine ─▶ Finished
prompts.py    the prompt stage (render + tokenize, cached)
budget.py     the context window and max_tokens
responses.py  shared responses (one engine run for identical deterministic requests)
media/        the image codec and one stage class per media mode
"""
