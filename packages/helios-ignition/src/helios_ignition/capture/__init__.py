"""Program capture: a builder that records kernel launches over named buffers."""
