"""Tandem's gRPC contracts: the .proto sources and their generated Python code.

Only each service's server.py and client.py import the generated modules.
"""
