"""Model families: forward passes written once against the program builder."""
