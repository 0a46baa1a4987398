"""stateremat.stats (see DESIGN.md, layer `stats`)."""
