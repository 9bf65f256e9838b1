"""The Cloud TPU API (tpu v2): its resources, request checks and catalog routes."""
