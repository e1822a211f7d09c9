"""The pipeline's stages behind one interface (client shared memory, classification)."""
