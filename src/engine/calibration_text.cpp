// Built-in calibration text: plain English prose written for kvpack (not taken from any book), varied
// in register (narrative, dialogue, description, explanation) so that the queries it produces look like
// those of ordinary text. Used by auto_calibration (engine/auto_calibration.h).
#include <string>
#include <vector>

namespace kvpack::detail {

const std::vector<std::string>& calibration_paragraphs() {
  static const std::vector<std::string> p = {
      "The morning was grey and still when Margaret walked down to the harbour. The boats lay quiet on the water, "
      "and the only sound was the slow knock of a rope against a mast. She had come to meet her brother, who had "
      "written that he would arrive on the first ferry, but the ferry was late, as it so often was in the winter.",
      "\"You will not find him here,\" said the old man who kept the ticket office. \"The crossing was rough last "
      "night, and they held the boat at the other side until the wind dropped.\" Margaret thanked him and sat down "
      "on the bench by the window, where she could watch the grey line of the sea.",
      "A town is made of small habits. The baker opens his shutters at six, the schoolchildren cross the square at "
      "half past eight, and by noon the market has filled the street with voices. Nobody plans these things, and "
      "yet they happen every day, as regular as the tide, and a stranger who stays a week begins to keep time by them.",
      "When water is heated in a closed vessel, its pressure rises, and the temperature at which it boils rises with "
      "it. This is why food cooks more quickly in a pressure cooker, and why water on a high mountain boils at a "
      "lower temperature than it does at the coast. The principle is simple, but it took many careful experiments "
      "before it was understood.",
      "Her brother came at last in the afternoon, tired and cheerful, with a bag over his shoulder and a story about "
      "a sailor who had been sick the whole way across. They walked up the hill together, talking of their mother, "
      "of the house, and of the letter from their cousin that neither of them had answered.",
      "It is often said that a good letter should read as if it were spoken. The writer should choose plain words, "
      "say one thing at a time, and stop when there is nothing more to say. Long sentences are not a fault in "
      "themselves, but a reader who must hold too much in mind at once will lose the thread.",
      "The garden behind the house had been left alone for three summers. Brambles had grown over the path, the "
      "apple trees were thick with moss, and the little pond was green. Yet in the corner by the wall the roses "
      "still flowered, red and heavy, as though someone had been caring for them all along.",
      "\"I do not think we should sell it,\" said Thomas, looking out at the orchard. \"Not yet. Let us see what it "
      "looks like in the spring.\" His sister did not answer at once. She was thinking of the roof, and of the cost "
      "of mending it, and of the long journey she would have to make every month if they kept the place.",
      "A map is a kind of argument. It says that this road matters and that one does not, that the river is worth "
      "drawing but the footpath beside it is not. Every map leaves things out, and the choice of what to leave out "
      "tells you as much about the map maker as what is drawn.",
      "In the evening the wind rose again, and rain beat against the windows. They lit a fire in the front room, "
      "and Thomas found an old pack of cards in the drawer of the desk. They played until late, and for a while "
      "neither of them spoke about the house at all.",
      "The train left the city a little after nine. For the first hour there was nothing to see but warehouses and "
      "the backs of houses, and then, quite suddenly, the fields opened out on both sides, flat and wet and shining "
      "under a pale sky. A woman across the aisle put down her newspaper and watched them go by.",
      "Most mistakes in arithmetic are not mistakes of understanding but of attention. A column is added twice, a "
      "digit is carried to the wrong place, a sign is dropped. The cure is not cleverness but care: to check each "
      "step, and to ask at the end whether the answer is about the size one expected.",
  };
  return p;
}

}  // namespace kvpack::detail
