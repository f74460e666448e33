"""Where cache values live beyond one process: the Redis second tier (redis_tier.py), under a
namespace fingerprinting what changes a value (namespace.py)."""
