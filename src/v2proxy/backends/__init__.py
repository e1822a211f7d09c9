"""Backends: each encodes the internal model for one kind of model server and decodes its
answers. A backend never knows which frontend asked."""
