"""localspec chat: the Textual terminal chat app over localspec's engine."""
