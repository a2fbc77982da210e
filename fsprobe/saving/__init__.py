"""The save inside the trainer: everything between a save call and a checkpoint it can
resume from. The kinds of save, their one loop and who keeps what: docs/design.md §7.
"""
