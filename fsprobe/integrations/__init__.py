"""Framework integrations, each importing its framework only when used (docs/integrations.md).

`lightning`, `lightning_callbacks`, `lightning_strategies`, `transformers`, `accelerate`, `dcp`,
`returnn`; what they may use of the save path: docs/design.md §12.
"""
