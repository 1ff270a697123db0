"""Quick-instruction heads: what a head is (heads.py) and how heads run beside or without a
main generation (service.py)."""
