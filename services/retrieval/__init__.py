"""Retrieval service: passages from the documents table for a query."""
