"""fastrank.ops"""
