"""The safe building blocks: backend, model, context, batch, samplers.

Each object owns one native handle, frees it on close() (or at garbage
collection as a safety net), and raises ClosedError when used afterwards.
"""
