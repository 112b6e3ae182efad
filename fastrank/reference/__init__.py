"""fastrank.reference"""
