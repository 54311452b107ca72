"""The commands of ``conveyor``, one module per command or command group; ``conveyor.cli``
registers them on the root group."""
