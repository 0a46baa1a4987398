"""stateremat.jax (see DESIGN.md, layer `jax`)."""
