"""The node: its parts (typed seams), the step loop, its own and its peers' rollouts, the memory fit, the checks before start, and the composition root."""
