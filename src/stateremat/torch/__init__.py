"""stateremat.torch (see DESIGN.md, layer `torch`)."""
