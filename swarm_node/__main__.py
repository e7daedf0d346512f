"""`python -m swarm_node ...`: the `swarm-node` command."""

from swarm_node.ops.cli import main

main()
