"""stateremat.profile (see DESIGN.md, layer `profile`)."""
