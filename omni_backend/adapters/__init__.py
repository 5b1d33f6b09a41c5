"""The request contract every pipeline's adapter follows (base.py); adapters live with their family."""
