"""The GCE metadata server each sandbox host has at its own address."""
