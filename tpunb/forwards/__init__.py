"""Port forwards: a listening port here that reaches a port on a host, and links to it."""
