"""Drafters: each proposes a tree of guesses for what the target will say next, behind one
base class (base.py); spec.py names them."""
