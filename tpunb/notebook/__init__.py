"""What the notebook's kernel does around its slices, apart from holding them (``tpunb.manager``):
the values a launch is given (``env``: --env and --secret), what its arguments must be
(``launch_args``), the hosts a user brings (``brought``), the stop button between cells
(``stop_button``) and this machine's own TPU (``own_tpu``: Colab's TPU runtime)."""
