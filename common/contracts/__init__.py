"""What the tiers agree on, each contract in one home: Redis key names (keys), the wire format
of jobs and replies (wire), the worker registry's fields (registry), the priority lanes
(priority) and a model's traffic policy (traffic)."""
