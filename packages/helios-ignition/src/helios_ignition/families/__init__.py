"""Model families: forward passes written once against the program builder (the registry a
recipe names them from: families/registry.py)."""
