"""Importers from user formats into dlverify's IR (installed as dlverify.frontends)."""
