"""`python -m compat`: print the active backend, torch-API layer, framework and device."""
import compat

for key, value in compat.info().items():
    print("%-18s %s" % (key, value))
