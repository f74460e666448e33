"""mmgate's gRPC service, in layers: docs/architecture.md is the map."""
