"""The status document: build.py builds it, for a running agent or a one-shot scan;
text.py renders it for people; server.py serves it on the status socket, and query() asks.
"""
