"""Save events: every fsprobe save tells the daemon watching its target how it went.

`event` is the value and its wire form, `emit` the trainer's side (one datagram, never
waited on), `receive` the daemon's side (the kernel's word for who sent it, bounded per uid),
`admission` the rule for which targets a sender may report saves into. docs/design.md
("Save events") says why it is a datagram socket in the state dir.
"""
