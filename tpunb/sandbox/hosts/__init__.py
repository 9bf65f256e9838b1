"""The sandbox's hosts: real sshd hosts, the TPU VM image, who logs in where."""
