"""The Kubernetes operator: the InferenceService API (spec.py, crd.py), pure manifest builders and
the fit check. It never imports the engine or torch; the engine command line (flotilla/flags.py) is
the contract between them."""
