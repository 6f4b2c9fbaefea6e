"""TorchServe handlers of segserve.

Everything in this package runs inside a TorchServe worker. It is copied
whole into every .mar so that the archives run on stock TorchServe with
only torch and torchvision installed: import nothing from `segserve` here.
"""
