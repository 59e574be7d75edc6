"""Images: a small ViT-style classifier whose patch positions are (row, column) pairs (`vit`), and the 8x8
digits of scikit-learn (`digits`, optional extra `vision`). Imported on demand: `import poskit` does not load it."""
