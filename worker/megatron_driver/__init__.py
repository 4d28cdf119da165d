"""remat's megatron backend driver: mapping (spec -> Megatron settings, no torch), metrics (the
worker's metrics file), shims (stand-ins for local-layer defects) and runner (torch + Megatron)."""
