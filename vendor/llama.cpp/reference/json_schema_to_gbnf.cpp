// Prints llama.cpp's own GBNF for the JSON schema on stdin (the converter of common/ in the pin).
#include "json-schema-to-grammar.h"
#include <iostream>
#include <iterator>
#include <string>
int main() {
    std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    try {
        std::cout << json_schema_to_grammar(common_json::parse(text), true);
    } catch (const std::exception & e) {
        std::cerr << "error: " << e.what() << "\n";
        return 1;
    }
    return 0;
}
