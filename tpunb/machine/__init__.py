"""What this process sees of its own machine and keeps for its life, below everything else: the
process table (``procs``: is a pid alive, when did it start) and the clients of outside systems made
once per kernel (``cache``). Nothing here names a backend, a slice or a host."""
