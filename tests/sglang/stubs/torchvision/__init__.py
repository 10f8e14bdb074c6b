"""IMPORT-ONLY STAND-IN for torchvision (see ../_import_only.py): SGLang imports
torchvision.transforms at module scope on the SubBlock import chain; no SubBlock test uses it."""
from _import_only import make_package

make_package(globals(), __name__, "0.0.0+stand-in")
