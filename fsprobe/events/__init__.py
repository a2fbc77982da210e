"""Save events: every fsprobe save tells the daemon watching its target how it went.

`event` (the value and its wire form), `emit` (the trainer's side), `receive` (the daemon's),
`admission` (which targets a sender may report into), `evidence`. docs/design.md §13.
"""
