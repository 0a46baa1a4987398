"""stateremat.finite (see DESIGN.md, layer `finite`)."""
