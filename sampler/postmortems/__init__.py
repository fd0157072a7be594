"""Postmortems: the files the child leaves and reading them back."""
