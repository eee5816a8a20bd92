"""One module per ``tuimon`` subcommand.

Each module defines ``register(subparsers)``, which adds its parser and sets ``handler`` (a
function taking the parsed namespace and returning an exit status). Module top levels import
only the standard library so that ``tuimon --help`` stays instant; heavy imports (textual, zmq,
torch) happen inside the handler.
"""
